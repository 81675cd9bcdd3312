"""radixlm.constrained"""
