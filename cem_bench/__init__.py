"""cem-bench: the accuracy-vs-privacy frontier of conditional-entropy (CEM) defenses for split learning."""

__version__ = "0.1.0"
