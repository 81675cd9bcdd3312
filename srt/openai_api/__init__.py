"""radixlm.srt.openai_api"""
