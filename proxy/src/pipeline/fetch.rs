//! Fetching an image or document a client sent by URL, for a target whose API reads
//! only inline bytes (its dialect's `form::Target` says so,
//! docs/translation.md#documents-and-media), once for the whole walk: a target that fetches
//! URLs itself is sent the URL. Client URLs are hostile: only `http(s)`, through the
//! upstream client that refuses names resolving to private, loopback or link-local
//! addresses, and here private IP literals too (`--fetch-media public`, the default); no
//! redirect is followed; the answer is capped at `--max-response-bytes` and held in the
//! answer budget (`--max-inflight-response-bytes`) while the walk lasts; at most
//! `--max-fetched-urls` URLs per request, each within the call's budget and
//! `--fetch-media-timeout` ([`FetchLimits`]). A URL that cannot be fetched leaves the
//! target skipped as `unsupportedFeature`, saying why.

use std::time::Duration;

use base64::Engine as _;
use http::{Request, Uri, header};
use tokio::time::{Instant, timeout_at};

use super::answer::{AnswerHeld, Capped, read_capped};
use super::attempt::Transport;
use super::walk::Walk;
use crate::observe::counters;

/// How much fetching one request may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchLimits {
    /// `--fetch-media-timeout`: the longest one fetch may take (less when the call's
    /// budget ends sooner).
    pub timeout: Duration,
    /// `--max-fetched-urls`: URLs fetched (or tried) per request at most.
    pub max_urls: usize,
}

impl Default for FetchLimits {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_FETCH_MEDIA_TIMEOUT,
            max_urls: DEFAULT_MAX_FETCHED_URLS,
        }
    }
}

/// The default `--fetch-media-timeout`.
pub(crate) const DEFAULT_FETCH_MEDIA_TIMEOUT: Duration = Duration::from_secs(30);
/// The default `--max-fetched-urls`.
pub(crate) const DEFAULT_MAX_FETCHED_URLS: usize = 8;

/// Which URLs the gateway fetches for a target that cannot (`--fetch-media`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MediaFetch {
    /// None: such targets are skipped as `unsupportedFeature`.
    Off,
    /// Public addresses only (the private-network guard of credentials).
    #[default]
    Public,
    /// Any address, private networks included: only where every client is trusted
    /// with what the proxy's network reaches.
    Any,
}

impl<T: Transport> Walk<'_, '_, T> {
    /// Whether `url` may be fetched now: fetching is on, it was not tried, and the
    /// request's count allows another.
    pub(super) fn may_fetch(&self, url: &str) -> bool {
        if self.gw.media_fetch == MediaFetch::Off
            || self.unfetched.iter().any(|(u, _)| u == url)
            || self.fetched.get(url).is_some()
        {
            return false;
        }
        if self.unfetched.len() + self.fetched_held.len() >= self.gw.fetch_limits.max_urls {
            counters::inc(&self.gw.refused.fetches_over_count);
            return false;
        }
        true
    }

    /// Fetch `url` into the walk's media, or note why it could not be.
    pub(super) async fn fetch_media(&mut self, url: String) {
        let limit = self.gw.fetch_limits.timeout;
        let deadline = self.budget.min(Instant::now() + limit);
        let got = match timeout_at(deadline, fetch(self, &url)).await {
            Ok(got) => got,
            Err(_) => {
                if deadline < self.budget {
                    counters::inc(&self.gw.refused.fetch_timeouts);
                }
                Err(format!(
                    "no answer within {}",
                    humantime::format_duration(limit)
                ))
            }
        };
        match got {
            Ok((media_type, data, held)) => {
                self.fetched.insert(url, media_type, data);
                self.fetched_held.push(held);
            }
            Err(why) => {
                tracing::debug!(route = %self.route.spec.id, url = %url, why = %why,
                    "media not fetched");
                self.unfetched.push((url, why));
            }
        }
    }
}

/// GET `url` within the limits; its media type (the answer's `content-type`, else
/// the URL's extension) and its bytes in base64, held in the answer budget.
async fn fetch<T: Transport>(
    walk: &Walk<'_, '_, T>,
    url: &str,
) -> Result<(String, String, AnswerHeld), String> {
    let gw = walk.gw;
    let uri: Uri = url.parse().map_err(|_| "not a URL".to_owned())?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("only http and https URLs are fetched".into());
    }
    let host = uri.host().ok_or("the URL has no host")?;
    let public = gw.media_fetch == MediaFetch::Public;
    if public
        && let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse()
        && switchback_crds::network::is_private_ip(ip)
    {
        return Err("a private, loopback or link-local address".into());
    }
    let request = Request::get(uri)
        .header(header::ACCEPT, "*/*")
        .header(header::ACCEPT_ENCODING, "identity")
        .body(crate::upstream::Body::default())
        .map_err(|e| e.to_string())?;
    let response = gw
        .media_client(!public)
        .request(request)
        .await
        .map_err(|e| format!("{e}"))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("it answered {status}"));
    }
    let media_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or(v).trim().to_ascii_lowercase())
        .filter(|m| !m.is_empty() && m != "application/octet-stream")
        .or_else(|| crate::providers::media_type_of_url(url).map(str::to_owned))
        .ok_or("its media type is not known")?;
    let cap = gw.upstream_limits.max_response_bytes;
    let (bytes, mut held) = match read_capped(response.into_body(), cap, &gw.answers).await {
        Ok(Capped::Whole(bytes, held)) => (bytes, held),
        Ok(Capped::TooLarge) => {
            gw.refused
                .responses
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(format!("larger than --max-response-bytes ({cap})"));
        }
        Ok(Capped::OverBudget) => {
            gw.refused
                .over_budget
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err("the replica holds as many answers as it may".into());
        }
        Err(e) => return Err(e.to_string()),
    };
    let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
    drop(bytes);
    if !held.grow_to(data.len()) {
        gw.refused
            .over_budget
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Err("the replica holds as many answers as it may".into());
    }
    Ok((media_type, data, held))
}
