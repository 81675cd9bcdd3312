"""radixlm.srt"""
