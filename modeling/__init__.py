"""geoformers.modeling"""
