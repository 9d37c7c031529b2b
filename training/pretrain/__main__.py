"""``python -m training.pretrain`` (and ``torchrun -m training.pretrain``): the pretraining CLI
of :mod:`training.pretrain.train`."""

import sys

from training.pretrain.train import main

if __name__ == "__main__":
    sys.exit(main())
