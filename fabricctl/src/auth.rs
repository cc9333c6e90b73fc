//! `fabricctl generate peer-command`, `token rotate` (provider side) and `peer out-of-band`
//! (consumer side): the authentication part of a peering between organizations, with
//! `fabric_auth` doing the work.
use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, bail};
use fabric_api::names;
use fabric_auth::{
    consumer::{self, OutOfBand, Step},
    run::published_pin,
    tls::{self, Trust},
    token::{self, PeerCommand},
};
use fabric_kube::meta::delete_gone_ok;
use fabric_peering::{Cluster, Side};
use k8s_openapi::{
    api::core::v1::{Namespace, Secret},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, PostParams},
};

/// Prints the command a consumer runs to peer with this cluster: with the standing token,
/// or with a one-time token of its own when `ttl` or `consumer_id` is given.
pub async fn generate_peer_command(
    local: Client,
    ns: &str,
    auth_url: &str,
    ttl: Option<Duration>,
    consumer_id: Option<&str>,
) -> Result<()> {
    anyhow::ensure!(
        auth_url.starts_with("https://"),
        "--auth-url must be the https:// URL where consumers reach this cluster's authentication service"
    );
    if ttl.is_some_and(|t| t.is_zero()) {
        bail!("--ttl must be longer than 0s: a token that expires at once is no token");
    }
    if let Some(id) = consumer_id {
        anyhow::ensure!(
            fabric_api::identity::is_dns_label(id),
            "--consumer-id {id:?} is not a cluster id (a DNS label)"
        );
    }
    let cluster = Cluster::read(Side::Local, local.clone(), ns).await?;
    let pin = published_pin(&local, ns).await?.with_context(|| {
        format!(
            "the authentication service has not created its certificate (Secret {}/{}) yet: \
             is `fabric-controller auth` running? Retry in a moment",
            ns,
            names::secret::AUTH_TLS
        )
    })?;
    let (secrets, tokens) = token_secrets(&local).await?;
    let token = match (ttl, consumer_id) {
        (None, None) => standing_token(&secrets, tokens).await?,
        (ttl, id) => {
            let ttl = ttl.unwrap_or(BOUND_TOKEN_TTL);
            let (t, expires, _) = mint(&secrets, tokens, ttl, id).await?;
            match id {
                Some(id) => {
                    eprintln!("The token is for cluster {id} only, once; it expires at {expires}.")
                }
                None => eprintln!(
                    "The token is for one cluster, once (the first that uses it); it expires at {expires}."
                ),
            }
            t
        }
    };
    let cmd = PeerCommand {
        auth_url: auth_url.to_owned(),
        cluster_id: cluster.id().to_owned(),
        token,
        auth_pin: Some(pin),
    };
    eprintln!("Run this on the consumer cluster (it holds a secret: pass it on privately):");
    println!("{}", cmd.shell_line());
    Ok(())
}

/// The peering tokens' Secrets, in [`names::namespace::PEERING_TOKENS`] (created when absent,
/// as deploy/ creates it) where nothing else lives, and that namespace's name.
async fn token_secrets(client: &Client) -> Result<(Api<Secret>, &'static str)> {
    let ns = names::namespace::PEERING_TOKENS;
    ensure_namespace(client, ns, "the peering tokens").await?;
    Ok((Api::namespaced(client.clone(), ns), ns))
}

/// Creates namespace `ns` (where `what` live) unless it exists, as deploy/ creates it: the
/// fabric's Secrets live in namespaces of their own, so that RBAC can grant each component
/// its own and nothing else.
async fn ensure_namespace(client: &Client, ns: &str, what: &str) -> Result<()> {
    let namespaces = Api::<Namespace>::all(client.clone());
    let present = namespaces
        .get_opt(ns)
        .await
        .with_context(|| format!("reading namespace {ns}, where {what} live"))?;
    if present.is_none() {
        let new = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &new).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("creating namespace {ns}, where {what} live"));
            }
        }
    }
    Ok(())
}

/// How long a token minted for a named consumer without `--ttl` is valid.
const BOUND_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);

/// A new one-time token, expiring after `ttl`, for consumer `cluster_id` only when given:
/// the token, its expiry and its Secret's name.
async fn mint(
    secrets: &Api<Secret>,
    ns: &str,
    ttl: Duration,
    cluster_id: Option<&str>,
) -> Result<(String, Timestamp, String)> {
    let t = token::generate();
    let expires = Timestamp::now() + ttl;
    let mut secret = token::secret(ns, &t, true, Some(expires));
    if let Some(id) = cluster_id {
        secret = token::bind(secret, id);
    }
    let name = secret.metadata.name.clone().unwrap_or_default();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .context("storing the new token")?;
    Ok((t, expires, name))
}

/// The standing token, created on first use and again once it expired.
async fn standing_token(secrets: &Api<Secret>, ns: &str) -> Result<String> {
    let name = names::secret::PEERING_TOKEN;
    let current = secrets.get_opt(name).await.context("reading the token")?;
    if let Some(s) = &current {
        let record = fabric_auth::validate::TokenRecord::from_secret(s).with_context(|| {
            format!("Secret {ns}/{name} holds no token: run `fabricctl token rotate`")
        })?;
        if record.expires_at.is_none_or(|at| at > Timestamp::now()) {
            return String::from_utf8(record.token).context("the stored token");
        }
        // Expired: a new one replaces it (conditionally: a concurrent replacement wins).
        let mut new = standing_secret(ns);
        new.metadata.resource_version = s.metadata.resource_version.clone();
        match secrets.replace(name, &PostParams::default(), &new).await {
            Ok(_) => {
                eprintln!("The standing token had expired: this command carries a new one.");
                return read_token(&new);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                return read_token(&secrets.get(name).await?);
            }
            Err(e) => return Err(e).context("replacing the expired token"),
        }
    }
    let new = standing_secret(ns);
    let stored = match secrets.create(&PostParams::default(), &new).await {
        Ok(s) => s,
        Err(kube::Error::Api(e)) if e.code == 409 => secrets.get(name).await?,
        Err(e) => return Err(e).context("storing the token"),
    };
    read_token(&stored)
}

fn standing_secret(ns: &str) -> Secret {
    token::secret(
        ns,
        &token::generate(),
        false,
        Some(Timestamp::now() + token::STANDING_TTL),
    )
}

fn read_token(s: &Secret) -> Result<String> {
    fabric_auth::validate::TokenRecord::from_secret(s)
        .and_then(|r| String::from_utf8(r.token).ok())
        .context("the stored token")
}

/// Revokes every peering token and creates a new standing one.
pub async fn token_rotate(local: Client) -> Result<()> {
    let (secrets, ns) = token_secrets(&local).await?;
    let old = secrets
        .list(&ListParams::default().labels(&token::selector()))
        .await
        .context("listing the peering tokens")?;
    for s in &old.items {
        let name = s.metadata.name.clone().unwrap_or_default();
        delete_gone_ok(&secrets, &name)
            .await
            .with_context(|| format!("deleting token Secret {name}"))?;
    }
    let new = standing_secret(ns);
    match secrets.create(&PostParams::default(), &new).await {
        Ok(_) => {}
        // A concurrent rotation made one already: that one stands.
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e).context("storing the new token"),
    }
    println!(
        "revoked {} peering token(s): peer commands printed before are refused from now on",
        old.items.len()
    );
    println!("`fabricctl generate peer-command` prints a command with the new token");
    Ok(())
}

/// What `peer out-of-band` is given (and what `peer` gives it).
pub struct OutOfBandArgs {
    pub auth_url: String,
    pub cluster_id: String,
    pub token: String,
    pub auth_pin: Option<String>,
    pub auth_ca: Option<PathBuf>,
    /// Resources to ask for once authenticated.
    pub ask: crate::follow::Ask,
    /// How long to follow the rest of the peering (zero: not at all).
    pub timeout: std::time::Duration,
}

pub async fn peer_out_of_band(local: Client, ns: &str, args: OutOfBandArgs) -> Result<()> {
    let trust = match (&args.auth_pin, &args.auth_ca) {
        (Some(pin), None) => Trust::Pin(tls::parse_pin(pin)?),
        (None, Some(ca)) => Trust::Ca(
            std::fs::read_to_string(ca)
                .with_context(|| format!("reading --auth-ca {}", ca.display()))?,
        ),
        (None, None) => bail!(
            "give --auth-pin (from the provider's peer command) or --auth-ca: the \
             authentication service's certificate must be checked"
        ),
        (Some(_), Some(_)) => bail!("give --auth-pin or --auth-ca, not both"),
    };
    // Checked before anything is created.
    let resources = args.ask.resources()?;
    let me = authenticate(&local, ns, &args, trust).await?;
    let terms = args.ask.at_most_once;
    request_and_follow(
        &local,
        ns,
        &me,
        &args.cluster_id,
        resources,
        terms,
        args.timeout,
    )
    .await
}

/// `peer` with the provider's admin kubeconfig at hand: the out-of-band flow, with a one-time
/// token minted on the provider (and revoked once used) and the pin read there. The admin
/// client lives only as long as this command: nothing of it is stored on this cluster.
pub async fn peer_in_band(
    local: Client,
    provider: Client,
    ns: &str,
    auth_url: String,
    ask: crate::follow::Ask,
    timeout: Duration,
) -> Result<()> {
    anyhow::ensure!(
        auth_url.starts_with("https://"),
        "--auth-url must be the https:// URL where this cluster reaches the provider's \
         authentication service"
    );
    let resources = ask.resources()?;
    let me = Cluster::read(Side::Local, local.clone(), ns).await?;
    let remote = Cluster::read(Side::Remote, provider.clone(), ns).await?;
    let pin = published_pin(&provider, ns).await?.with_context(|| {
        format!(
            "the provider's authentication service has not created its certificate (Secret \
             {ns}/{}) yet: is `fabric-controller auth` running there? Retry in a moment",
            names::secret::AUTH_TLS
        )
    })?;
    let (secrets, tokens) = token_secrets(&provider)
        .await
        .context("minting a token on the provider")?;
    let (token, expires, secret) = mint(&secrets, tokens, IN_BAND_TOKEN_TTL, Some(me.id()))
        .await
        .context("minting a token on the provider")?;
    println!(
        "✓ minted a one-time token on {} for {} (Secret {tokens}/{secret}, expires at {expires})",
        remote.id(),
        me.id()
    );
    let args = OutOfBandArgs {
        auth_url,
        cluster_id: remote.id().to_owned(),
        token,
        auth_pin: Some(pin.clone()),
        auth_ca: None,
        ask,
        timeout,
    };
    let authenticated = authenticate(&local, ns, &args, Trust::Pin(tls::parse_pin(&pin)?)).await;
    // One time: used or not, it goes.
    let revoked = delete_gone_ok(&secrets, &secret).await;
    let me = authenticated?;
    match revoked {
        Ok(()) => println!("✓ revoked the one-time token"),
        Err(e) => eprintln!(
            "warning: the one-time token Secret {ns}/{secret} on {} could not be deleted ({e}); \
             it expires at {expires}",
            remote.id()
        ),
    }
    let terms = args.ask.at_most_once;
    request_and_follow(&local, ns, &me, remote.id(), resources, terms, args.timeout).await
}

/// How long the token `peer` mints on the provider is valid, should its deletion fail.
const IN_BAND_TOKEN_TTL: Duration = Duration::from_secs(600);

/// Authenticates to the provider of `args` and keeps the identity; returns this cluster.
async fn authenticate(
    local: &Client,
    ns: &str,
    args: &OutOfBandArgs,
    trust: Trust,
) -> Result<Cluster> {
    let me = Cluster::read(Side::Local, local.clone(), ns).await?;
    anyhow::ensure!(
        me.id() != args.cluster_id,
        "--cluster-id {} is this cluster's own id: run the peer command on the consumer cluster",
        args.cluster_id
    );
    println!(
        "Authenticating {} (consumer) to {} (provider) at {}",
        me.id(),
        args.cluster_id,
        args.auth_url
    );
    ensure_namespace(
        local,
        names::namespace::IDENTITIES,
        "the identities providers issue",
    )
    .await?;
    let command = OutOfBand {
        auth_url: args.auth_url.clone(),
        provider_id: args.cluster_id.clone(),
        token: args.token.clone().into(),
        trust,
    };
    consumer::authenticate(local, ns, me.id(), &command, |step| match step {
        Step::KeyGenerated => println!("✓ generated a key pair (the private key stays in this cluster)"),
        Step::Signed {
            tenant_namespace,
            api_server_url,
            expiry,
        } => println!(
            "✓ authenticated: certificate issued{} for namespace {tenant_namespace} on {api_server_url}",
            expiry.map(|t| format!(" (valid until {t})")).unwrap_or_default()
        ),
        Step::Stored {
            namespace,
            secret_namespace,
            secret,
            identity,
            foreign_cluster,
        } => println!(
            "✓ stored Secret {secret_namespace}/{secret}, Identity {namespace}/{identity} and ForeignCluster {foreign_cluster}"
        ),
        Step::Verified => println!("✓ the identity works on the provider's API server"),
    })
    .await?;
    Ok(me)
}

/// Once authenticated: asks for `resources` and follows the modules coming up.
async fn request_and_follow(
    local: &Client,
    ns: &str,
    me: &Cluster,
    provider: &str,
    resources: std::collections::BTreeMap<
        String,
        k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    >,
    at_most_once: Option<fabric_api::offloading::v1alpha1::AtMostOnce>,
    timeout: Duration,
) -> Result<()> {
    let asked = !resources.is_empty();
    if asked {
        let slice = crate::follow::slice(ns, me.id(), provider, resources, at_most_once);
        crate::follow::request(local, &slice).await?;
        println!("✓ asked {provider} for resources (ResourceSlice {ns}/{provider})");
    }
    if timeout.is_zero() {
        println!(
            "Authenticated with {provider}. The network{} follow from the controllers; \
             `fabricctl info peer {provider}` shows how far they are.",
            if asked {
                ", resources and virtual node"
            } else {
                ""
            }
        );
        return Ok(());
    }
    let progress = crate::follow::Progress::new(crate::follow::modules(asked));
    crate::follow::follow(local, provider, progress, timeout).await?;
    println!("Peered with {provider}: `fabricctl info peer {provider}` shows the details.");
    Ok(())
}
