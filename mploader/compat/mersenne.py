"""The one constant both generators mploader reads in place share: the Mersenne Twister
MT19937's state is 624 32-bit words, in torch's CPU generator (``mploader.compat.
torch_generator``) and in Python's ``random.Random`` (``mploader.compat.cpython``) alike."""

from __future__ import annotations

MT_WORDS = 624
