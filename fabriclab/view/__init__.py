"""The fabric drawn: where each switch, host and cable goes (`layout`), what a run's samples say
about each of them over time (`frames`), the self-contained page that shows both (`page`), and
for a running lab the live frames (`live`), the buttons' requests (`actions`) and the server
that carries them (`server`); and the running lab's counters for Prometheus (`metrics`).
"""

DEFAULT_ADDRESS = "127.0.0.1:8765"      # where `up --web` and the prompt's `web` serve by default
METRICS_ADDRESS = "127.0.0.1:9464"      # where `up --metrics` serves /metrics by default
