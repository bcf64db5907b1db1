//! The one integration-test binary: a real Postgres, real servers on port 0, each test in
//! a database of its own that it creates and drops.

mod api_service_requests;
mod api_workflows;
mod broker_amqp;
mod broker_kafka;
mod children;
mod console;
mod delayed;
mod downstream;
mod durability;
mod engine;
mod engine_recovery;
mod failover;
mod fanout;
mod faults;
mod front_door;
mod hardening;
mod idempotency_cleanup;
mod openapi;
mod pki;
mod rerun;
mod retention;
mod retry;
mod schedules;
mod schema;
mod search;
mod status_reads;
mod support;
mod tls_brokers;
mod tls_postgres;
mod tls_server;
mod tls_steps;
mod traces;
mod upgrade;
mod versions;
mod workflow_files;
