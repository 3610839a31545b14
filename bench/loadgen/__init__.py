"""The load generator: what a run sends and how it is sent -- named workloads (arrivals,
request-length traces, prompts with reuse), their shared flags, and the open-loop streaming
client behind `ascendra bench` with its server-sent-event reader."""
