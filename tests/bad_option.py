"""The errors a bad option value may raise: resid's own ResidError, or, when the runtime type checks are on (as
in these tests, and for users with RESID_TYPECHECK=1), the type checker's error for a value outside the option's
Literal, which names the parameter and its allowed values first."""

from jaxtyping import TypeCheckError

from resid.errors import ResidError

BAD_OPTION = (ResidError, TypeCheckError)
