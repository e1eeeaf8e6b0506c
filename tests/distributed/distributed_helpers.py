"""What the distributed tests share (not a test file): the reason Ray tests skip, and small inputs."""

from swap_prompts import BASELINES, DONORS, PROMPTS, TARGETS  # noqa: F401  (the tests import them from here)

RAY_REASON = "the Ray tests need the distributed extra: pip install 'resid-stream[distributed]'"
# Logical CPUs each test worker reserves: a module's shared executor and a test's own (up to 3 workers) fit
# together on the 2-CPU cluster (Ray schedules by these numbers only; the workers are idle most of the time).
TEST_CPUS = 0.25

REFERENCE = ["Reference text one is here, and it is long enough to cover every position of the prompts.",
             "More words.", "A third reference text, of middling length.", "And a fourth."]
TEXTS = [
    "The weather was fine and the garden was green, so we walked to the river and back again.",
    "My neighbour has a cat that sleeps all day.",
    "Numbers such as 12 and 40 appear here.",
    "Short.",
    "A longer document follows, with commas, clauses and a few numbers (3, 5, 8) to make the windows differ.",
] * 3
