"""EROICA function behaviour patterns: localisation from ``functions.jsonl`` (EROICA §4.3).

``table`` holds the patterns column-wise, ``expectation`` the distance from expected ranges D,
``differential`` the differential distance Δ and its median + k·MAD outlier rule, ``imbalance``
the "same μ, spread β" load-imbalance check (§6.2 Problem 4), ``localise`` the per-function
verdict of Eq. 11, ``explain`` its sentences and ``engine`` the Diagnosis.
"""
