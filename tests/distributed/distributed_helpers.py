"""What the distributed tests share (not a test file): the reason Ray tests skip, and small inputs."""

RAY_REASON = "the Ray tests need the distributed extra: pip install 'resid[distributed]'"
# Logical CPUs each test worker reserves: a module's shared executor and a test's own (up to 3 workers) fit
# together on the 2-CPU cluster (Ray schedules by these numbers only; the workers are idle most of the time).
TEST_CPUS = 0.25

# Prompts 0/1 and 2/3 have equal token counts, so each pair can donate to the other (resample ablation).
PROMPTS = [
    "When Mary and John went to the store, John gave a drink to",
    "When John and Mary went to the store, Mary gave a drink to",
    "The cat and the dog sat on the mat, the cat looked at",
    "The dog and the cat sat on the mat, the dog looked at",
]
DONORS = [PROMPTS[1], PROMPTS[0], PROMPTS[3], PROMPTS[2]]
TARGETS, BASELINES = [" Mary", " John", " the", " the"], [" John", " Mary", " a", " a"]
REFERENCE = ["Reference text one is here, and it is long enough to cover every position of the prompts.",
             "More words.", "A third reference text, of middling length.", "And a fourth."]
TEXTS = [
    "The weather was fine and the garden was green, so we walked to the river and back again.",
    "My neighbour has a cat that sleeps all day.",
    "Numbers such as 12 and 40 appear here.",
    "Short.",
    "A longer document follows, with commas, clauses and a few numbers (3, 5, 8) to make the windows differ.",
] * 3
