"""Synthetic EROICA function behaviour patterns (``functions.jsonl``) with ground truth.

``cases`` reproduces the paper's case studies on a typical training job's functions;
``engine`` writes them as a bundle with truth.json.
"""
