"""The version of django-leader (below every module: a candidate announces it)."""

__version__ = "0.1.0.dev0"
