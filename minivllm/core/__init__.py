"""Scheduling and KV-cache bookkeeping: pure Python, no torch, shared by engine and simulator."""
