"""The installed layout: pyproject.toml lists every package (setuptools does not find the analyses itself, since
the folder analyses/ installs as resid.analyses), and the mapping is the one the imports use."""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_package_folder():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = setuptools["package-dir"]
    folders = {}
    for package, folder in mapping.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            parts = init.parent.relative_to(ROOT / folder).parts
            folders[".".join([package, *parts])] = init.parent
    listed = set(setuptools["packages"])
    missing, extra = sorted(set(folders) - listed), sorted(listed - set(folders))
    assert not missing and not extra, f"pyproject.toml packages: missing {missing}, extra {extra}"


def test_the_analyses_import_from_their_folder():
    import resid.analyses

    assert Path(resid.analyses.__file__).resolve().parent == ROOT / "analyses"


def test_the_lazy_public_names_resolve():
    # resid.analyses imports nothing eagerly; its names resolve at first use, Execution to the one class every long
    # job takes (README: `from resid.analyses import Execution`)
    import resid.analyses
    from resid.analyses import Execution, corpus, tables
    from resid.analyses.distributed.execution import Execution as defined

    assert Execution is defined and Execution().batch_size == "auto" and Execution().progress is None
    assert corpus.__name__ == "resid.analyses.io.corpus" and tables.__name__ == "resid.analyses.io.tables"
    assert set(resid.analyses.__all__) == {"Execution", "corpus", "provenance", "tables", "logit_lens", "tuned_lens"}
    from resid.analyses import logit_lens, tuned_lens  # the lenses' names from before they had one home

    assert logit_lens.__name__ == "resid.analyses.lenses.predictions" and tuned_lens.__name__ == "resid.analyses.lenses"
