"""What plans cost: communication (alpha-beta or Slapo's counts) and local compute.

``communication`` prices reshard steps and holds the compute roofline the cost models share.
"""
