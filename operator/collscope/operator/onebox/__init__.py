"""The whole collscope data path on one machine (issue 6): rank processes driving the real
plugin, real node agents on loopback addresses, the operator's trigger and analysis."""
