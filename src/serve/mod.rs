//! `sparse-knn serve`: one long-lived session answering SQL over Arrow Flight SQL, shared by
//! every client so that every client uses the same kept indexes.
//!
//! - [`served_session`]: the session (every function of this crate, URL tables), its reads
//!   confined to [`ReadRoots`] ([`files`]).
//! - [`Server`]: binds, checks each call's bearer token ([`auth`]), and serves
//!   [`service::SqlEndpoint`] (statements, prepared statements) until stopped.
//!
//! `docs/serve.md` is the user's guide; `tests/it/serve.rs` talks to a server on 127.0.0.1.

pub mod auth;
pub mod files;
mod placeholders;
pub mod service;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use datafusion::catalog::UrlTableFactory;
use datafusion::common::{exec_datafusion_err, plan_err, Result};
use datafusion::datasource::dynamic_file::DynamicListTableFactory;
use datafusion::execution::context::SessionContext;
use datafusion::execution::object_store::DefaultObjectStoreRegistry;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::SessionConfig;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, ServerTlsConfig};

pub use auth::Token;
pub use service::{Limits, SqlEndpoint};

pub use crate::confine::ReadRoots;

/// How a server listens and whom it lets in.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where to listen; port 0 takes a free one ([`Server::addr`] says which).
    pub bind: SocketAddr,
    /// The bearer token every call must carry; without one the server binds loopback only.
    pub token: Token,
    /// PEM certificate chain and private key: TLS instead of plain HTTP/2.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    pub limits: Limits,
}

/// A session for serving: this crate's functions and settings, URL tables, its memory pool,
/// and every file it reads (planning included) confined to `roots`. Object-store URLs (s3://)
/// are not served.
pub fn served_session(roots: &ReadRoots, memory_limit: Option<usize>) -> Result<SessionContext> {
    let config = SessionConfig::new()
        .with_information_schema(true)
        .with_option_extension(crate::options::SparseKnnConfig::default())
        .with_option_extension(roots.clone());
    let stores = DefaultObjectStoreRegistry::new();
    let local = url::Url::parse("file://").expect("a constant URL");
    use datafusion::execution::object_store::ObjectStoreRegistry;
    stores.register_store(
        &local,
        Arc::new(files::ConfinedFileStore::new(roots.clone())),
    );
    let mut runtime = crate::runtime_env_builder().with_object_store_registry(Arc::new(stores));
    if let Some(bytes) = memory_limit {
        runtime = runtime.with_memory_limit(bytes, 1.0);
    }
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime.build_arc()?)
        .with_default_features()
        .build();
    let ctx = SessionContext::new_with_state(state);
    let factory = Arc::new(files::ConfinedUrlTables::new(
        DynamicListTableFactory::new(Default::default()),
        roots.clone(),
    ));
    let ctx = crate::planner::with_url_tables(
        ctx,
        Arc::clone(&factory) as Arc<dyn UrlTableFactory>,
        factory.inner(),
    );
    crate::register_all(&ctx)?;
    Ok(ctx)
}

/// A running server: stop it with [`Server::stop`], or wait for it to end.
pub struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<()>>,
}

impl Server {
    /// Binds `options.bind` and serves `ctx` on it in a task of the current runtime.
    pub async fn start(ctx: SessionContext, options: ServeOptions) -> Result<Server> {
        if !options.token.is_set() && !options.bind.ip().is_loopback() {
            return plan_err!(
                "refusing to listen on {} without a token: anyone who reaches it could query this session; give a token (--token-file or SPARSE_KNN_TOKEN) or bind a loopback address such as 127.0.0.1",
                options.bind
            );
        }
        let listener = tokio::net::TcpListener::bind(options.bind)
            .await
            .map_err(|e| exec_datafusion_err!("cannot listen on {}: {e}", options.bind))?;
        let addr = listener
            .local_addr()
            .map_err(|e| exec_datafusion_err!("cannot listen on {}: {e}", options.bind))?;
        let mut builder = tonic::transport::Server::builder()
            // A client that stops reading does not hold a statement's slot forever.
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(20)));
        if let Some((cert, key)) = &options.tls {
            builder = builder
                .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
                .map_err(|e| exec_datafusion_err!("TLS certificate or key: {e}"))?;
        }
        let token = options.token.clone();
        let endpoint = SqlEndpoint::new(ctx, options.limits.clone());
        let service =
            FlightServiceServer::with_interceptor(endpoint, move |request| token.admit(request));
        let (stop, stopped) = oneshot::channel::<()>();
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let task = tokio::spawn(async move {
            builder
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await
                .map_err(|e| exec_datafusion_err!("the server stopped: {e}"))
        });
        log::info!(
            "serve: accepting calls on {addr}{}{}",
            if options.tls.is_some() { " (TLS)" } else { "" },
            if options.token.is_set() {
                ", bearer token required"
            } else {
                ", no token: loopback only"
            }
        );
        Ok(Server {
            addr,
            stop: Some(stop),
            task,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops taking calls, lets the running ones finish, and returns once it has stopped.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.wait().await
    }

    /// Returns when the server stops (an error of its listener, or [`Server::stop`]).
    pub async fn wait(self) -> Result<()> {
        self.task
            .await
            .map_err(|e| exec_datafusion_err!("the server's task ended: {e}"))?
    }
}
