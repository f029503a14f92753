"""Pure DataFrame → DataFrame steps (no reads, writes or collects) plus the small
driver-side planning functions they need."""
