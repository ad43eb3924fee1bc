"""geoformers.training"""
