"""radixlm.srt.models"""
