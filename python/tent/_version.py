# The package version: the libtent version it wraps (tent.h's
# TENT_VERSION_MAJOR.MINOR.PATCH; the header test checks they agree).
__version__ = "0.1.0"
