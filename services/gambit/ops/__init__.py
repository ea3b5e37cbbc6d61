"""Operations: the code that generates deploy/ (Serve config, Prometheus rules, Grafana dashboards),
the Helm chart's copies of them, and the `gambit cluster` commands. Imports no Ray."""
