//! Names resolved for a call, then judged: the HTTP steps' resolver (hyper's connector
//! dials only what it returns) and `Destinations::addrs`, which the AMQP connector and
//! the Kafka relay dial from, so no client resolves a checked name a second time.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::{Destinations, Refused};

/// Why no address to dial was found.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The policy refuses the host or every address it resolves to: permanent.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// The name did not resolve (now): transient.
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
}

impl Destinations {
    /// The addresses a connection to `host:port` may use: `host` judged by name, then
    /// resolved (an address is taken as it is) and every address judged; refused when
    /// none is left. The caller connects to these and nothing else.
    pub async fn addrs(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, DialError> {
        self.check_host(host)?;
        let bare = host.trim_matches(['[', ']']);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let found: Vec<SocketAddr> = tokio::net::lookup_host((bare, port))
            .await
            .map_err(|source| DialError::Resolve {
                host: bare.to_string(),
                source,
            })?
            .collect();
        Ok(self.filter(bare, found)?)
    }
}

/// The name resolver of HTTP steps: the system's (getaddrinfo, as hyper's), then the
/// policy's filter, so a name is checked by the addresses the call will use.
#[derive(Clone)]
pub struct Resolver {
    gai: hyper_util::client::legacy::connect::dns::GaiResolver,
    policy: Arc<Destinations>,
}

impl Resolver {
    pub fn new(policy: Arc<Destinations>) -> Resolver {
        Resolver {
            gai: hyper_util::client::legacy::connect::dns::GaiResolver::new(),
            policy,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<hyper_util::client::legacy::connect::dns::Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let mut gai = self.gai.clone();
        let policy = self.policy.clone();
        Box::pin(async move {
            policy.check_host(name.as_str())?;
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> = gai.call(name).await?.collect();
            Ok(policy.filter(&host, addrs)?.into_iter())
        })
    }
}
