"""The depth-limit lab: depth-scaled ResNets and p-variation of Susanna's master's thesis;
its experiments (Tables 4.1-4.5) are the job ``pathlift.jobs.depth``."""

from pathlift.depth.pvar import p_variation

__all__ = ["p_variation"]
