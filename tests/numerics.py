"""The tolerances the tests compare floats with, stated once, and why they are what they are.

Two float32 computations of the same value that differ only in the order of their reductions (a batch of other
size or composition, another thread count, a fused kernel against the explicit one, resuming from a saved
residual) differ by rounding: each of the k multiply-adds behind a value of size s can contribute up to
eps * s (eps = 2**-23 = 1.2e-7), and the differences add up like a random walk, about sqrt(k) * eps * s, with
k * eps * s the worst case. Across a tiny test model (d_model 32-64, 2-4 layers, d_mlp up to 256) a logit
accumulates k of a few thousand, so differences reach about 1e-5 of the values' size (seen: 1.1e-5 on a score,
2.3e-5 on a head's write, on a loaded 2-core machine). TINY gives that ten times over; it is still four to five
orders of magnitude below what any wrong patch, missing position or swapped head changes (0.1 and more), so it
cannot hide a bug.

Real models run k in the hundreds of thousands (SmolLM2: 30 layers, d_model 576, d_mlp 1536), logits of size
10-20: REAL allows for that. Exactness invariants that sum the same float32 numbers in float64 (components summed
to the logit) are tighter by construction and keep their own, smaller tolerance (EXACT).

Results that must not depend on the number of workers at all are made equal by construction instead (the same
chunks, merged in chunk order) and compared with `==`.
"""

EPS = 2.0**-23  # float32's machine epsilon
TINY = dict(rtol=1e-4, atol=1e-4)  # float32 reduction-order noise on the tiny test models, ten times over
REAL = dict(rtol=1e-3, atol=1e-3)  # the same on SmolLM2-size models (values of size ~10, k ~ 1e5)
EXACT = dict(rtol=1e-5, atol=1e-5)  # one float32 computation, summed in float64 (sums of decompositions)
