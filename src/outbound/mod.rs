//! Calling the outside world: a step's HTTP call (`http_step`), its publish to AMQP or
//! Kafka (`publish`), the TLS it uses (`tls`), the per-host limit on calls in flight
//! (`limits`), what one attempt's failure was (`call`), the JSON a call sends and gets
//! (`doc`), and the span a step's call is traced under (`step_trace`). It knows nothing of
//! requests, leases or Postgres: the engine decides what to call and records the outcome.

pub(crate) mod call;
pub(crate) mod doc;
pub(crate) mod http_step;
pub(crate) mod limits;
pub(crate) mod publish;
pub(crate) mod step_trace;
pub(crate) mod tls;
