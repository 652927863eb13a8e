"""The generation request path as stages (issue 38): an endpoint parses and renders, the shared
stages in between each return one frozen value. ``run.py`` reads top to bottom:
parse -> prompt -> sampling -> engine requests -> route -> stream -> render."""
