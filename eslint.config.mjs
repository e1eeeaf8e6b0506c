// The package's browser scripts (package data inlined into pages: analyses/graphs/viewer.js,
// analyses/attention_view.js), for `npx eslint analyses` (ESLint 9). Plain scripts in an IIFE, no modules.
export default [{
  files: ["analyses/**/*.js"],
  languageOptions: {
    ecmaVersion: 2022, sourceType: "script",
    globals: {document: "readonly", window: "readonly", Image: "readonly", XMLSerializer: "readonly",
              Event: "readonly"},
  },
  rules: {"no-undef": "error", "no-unused-vars": "error", "no-redeclare": "error", "no-dupe-keys": "error",
          "no-unreachable": "error", "eqeqeq": ["error", "smart"], "prefer-const": "error", "no-var": "error"},
}];
