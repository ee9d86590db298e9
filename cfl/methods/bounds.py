"""Upper bounds of the built-in methods' numeric parameters, by kind.

A parameter without one lets a typo through that breaks a run late (GEM ``margin: 1e300`` fails in the solver,
FedLwF ``temperature: 1e300`` silently flattens the distillation to nothing) or never ends (a generator of
``nz: 10**12``). Each bound is far above every value the papers and official code use, and low enough that the
state and memory it implies fit one machine; each field's ``max`` cites the kind it belongs to.
``tests/methods/test_method_bounds.py`` checks that every numeric parameter of every registered method has finite bounds
and that a value beyond them is refused when the config is validated (exit code 2, naming the key).
"""

from __future__ import annotations

from cfl.config.keys import BATCH_SIZE_MAX

#: weights of a loss term or penalty: published values span 1e-3..1e4 (EWC grids reach 1e4); 1e6 leaves two
#: orders of headroom, and above it ``lr * weight`` passes the penalty's stability bound (docs/reliability.md,
#: "Non-finite values") for any lr above 2e-6
WEIGHT_MAX = 1e6
#: softmax temperatures of a distillation: the papers use 1..20 (LwF and FLwF-2T: 2, Hinton et al. up to 20); at
#: T = 100 the softened targets already differ from uniform by under 1 % for logits within +-10, and far above it
#: the distillation silently vanishes
TEMPERATURE_MAX = 100.0
#: learning rates of a method's own optimiser (a generator's Adam, L-BFGS, a prototype's SGD, an adaptive
#: server): official values are 1e-3..1; any step above 10 diverges at once
LR_MAX = 10.0
#: memory slots and samples a client keeps or draws for a step, and samples per forward pass: as the run's
#: ``batch_size`` (2**20), more than a client holds of every task of a bundled stream together (five tasks of the
#: largest bundled training set, SVHN's 73,257 samples, are 366,285)
SAMPLES_MAX = BATCH_SIZE_MAX
#: images a server-side generator makes per step, with the activations of the generator and the teacher kept for
#: the backward pass: 2**16 (official: 128..256) is about 0.8 GB of 32x32x3 inputs alone
GENERATED_BATCH_MAX = 2**16
#: optimisation steps or rounds of a method's own loop at a task end (official: 10..400): 10,000 keeps a task
#: end to hours at most, where 10**12 would never end
STEPS_MAX = 10_000
#: a generator's noise width (official: TARGET 256, MFCL 1000): its first layer has ``nz x width x (S/4)^2``
#: weights, 4096 x 512 x 64 = 134 M (0.5 GiB, 1.6 GiB with Adam's moments) at the width bounds below
NOISE_MAX = 4096
#: a generator's channel widths (official: TARGET's ngf 64, MFCL's 128 and 64): with :data:`NOISE_MAX` at most
#: 512 channels in its first map (TARGET's is 2 ngf wide, so ngf <= 256)
WIDTH_MAX = 512
#: the width M of a random feature projection (RanPAC: the paper's and official code's 10000): the clients' and the
#: server's float64 Gram is M x M, 3.2 GB at 20,000 (per head slot), and each solve is O(M^3)
PROJECTION_MAX = 20_000
#: the ridge lambda of a closed-form head on random features: the official RanPAC code searches 1e-8..1e8 (its Gram
#: grows with M and the samples, so the lambda that matters is larger than a penalty weight's)
RIDGE_MAX = 1e8
