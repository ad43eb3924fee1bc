"""geoformers.tokenization"""
