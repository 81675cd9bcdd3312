"""radixlm.managers"""
