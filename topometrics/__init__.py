"""topometrics: does the topology of a transformer's weights and representations track its training?"""

__version__ = "0.1.0"
