"""geoformers.configuration"""
