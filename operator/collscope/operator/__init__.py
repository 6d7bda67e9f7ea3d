"""collscope operator: trigger, root-cause analysis and remediation for training jobs."""
