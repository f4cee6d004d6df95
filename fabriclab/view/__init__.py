"""The fabric drawn: where each switch, host and cable goes (`layout`), what a run's samples say
about each of them over time (`frames`), and the self-contained page that shows both (`page`).
"""
