"""Credit and advantage math: small pure functions on tensors, one per equation of the papers."""
