"""The shell around the engines: command line, controller, HTTP API, supervision."""
