"""Prompts the ablation tests share (not a test file): 0/1 and 2/3 are name-swapped pairs with equal token counts,
so each is the other's resample donor."""

PROMPTS = [
    "When Mary and John went to the store, John gave a drink to",
    "When John and Mary went to the store, Mary gave a drink to",
    "The cat and the dog sat on the mat, the cat looked at",
    "The dog and the cat sat on the mat, the dog looked at",
]
DONORS = [PROMPTS[1], PROMPTS[0], PROMPTS[3], PROMPTS[2]]
TARGETS, BASELINES = [" Mary", " John", " the", " the"], [" John", " Mary", " a", " a"]
