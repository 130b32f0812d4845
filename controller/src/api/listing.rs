//! Query parameters that every listing reads the same way (nodes, ports, portgroups, chassis,
//! allocations, templates, volume, history, the audit trail…), and the one builder of a full
//! page's `next` link ([`NextLink`]), which every listing uses.

use super::version::not_acceptable;
use super::ApiError;
use rivet_model::microversions as mv;
use rivet_store::SortDir;

use std::collections::HashMap;

/// 400 for a query parameter the request's handler does not take, naming the ones it does.
pub fn unknown_param(bad: &str, allowed: &[&str]) -> ApiError {
    ApiError::bad_request(format!(
        "unknown query parameter {bad:?}; supported: {}",
        allowed.join(", ")
    ))
}

/// [`unknown_param`] for the first key of `keys` that is not in `allowed`.
pub fn only_params<'a>(
    keys: impl IntoIterator<Item = &'a String>,
    allowed: &[&str],
) -> Result<(), ApiError> {
    match keys.into_iter().find(|k| !allowed.contains(&k.as_str())) {
        Some(bad) => Err(unknown_param(bad, allowed)),
        None => Ok(()),
    }
}

/// The page size asked for by `limit`: at most `max`; absent or 0 means `max` (as Ironic).
pub fn page_limit(params: &HashMap<String, String>, max: usize) -> Result<usize, ApiError> {
    let Some(l) = params.get("limit") else {
        return Ok(max);
    };
    let l: usize = l
        .parse()
        .map_err(|_| ApiError::bad_request(format!("limit={l:?} is not a non-negative integer")))?;
    Ok(if l == 0 { max } else { l.min(max) })
}

/// `asc` or `desc`; None for anything else (each listing says what its directions mean).
pub fn sort_dir(value: &str) -> Option<SortDir> {
    match value {
        "asc" => Some(SortDir::Asc),
        "desc" => Some(SortDir::Desc),
        _ => None,
    }
}

/// The query a single-resource GET takes (`?fields=a,b`), for nodes and chassis alike.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShowParams {
    /// Comma-separated fields to keep.
    pub fields: Option<String>,
}

/// The query of a single-resource GET that Ironic lets take `detail` too, and ignores it
/// (the volume API).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShowParamsDetail {
    /// Comma-separated fields to keep.
    pub fields: Option<String>,
    #[allow(dead_code)]
    detail: Option<String>,
}

/// A boolean query value as Ironic reads one (oslo's strict `bool_from_string`): `1 t true
/// on y yes` and `0 f false off n no`, any case; anything else is a 400 naming `name`.
pub fn bool_value(name: &str, v: &str) -> Result<bool, ApiError> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "on" | "y" | "yes" => Ok(true),
        "0" | "f" | "false" | "off" | "n" | "no" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "Invalid value for {name}: {v:?} is not a boolean (true or false)"
        ))),
    }
}

/// The boolean query parameter `name`, when given.
pub fn bool_param(params: &HashMap<String, String>, name: &str) -> Result<Option<bool>, ApiError> {
    params.get(name).map(|v| bool_value(name, v)).transpose()
}

/// `sort_dir`, when given, with Ironic's message for anything but `asc`/`desc`.
pub fn sort_dir_param(params: &HashMap<String, String>) -> Result<Option<SortDir>, ApiError> {
    params
        .get("sort_dir")
        .map(|d| {
            sort_dir(d).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Invalid sort direction: {d}. Acceptable values are 'asc' or 'desc'"
                ))
            })
        })
        .transpose()
}

/// Whether a listing shows whole documents: its `/detail` path, or `?detail=true` (which
/// Ironic refuses together with `fields`).
pub fn detail_param(params: &HashMap<String, String>, from_detail: bool) -> Result<bool, ApiError> {
    let asked = bool_param(params, "detail")?.unwrap_or(false);
    if asked && !from_detail && params.contains_key("fields") {
        return Err(ApiError::bad_request(
            "Can not specify ?detail=True and fields in the same request.",
        ));
    }
    Ok(from_detail || asked)
}

/// A comma-separated list parameter.
pub fn list_param(params: &HashMap<String, String>, key: &str) -> Vec<String> {
    params.get(key).map(|v| split_list(v)).unwrap_or_default()
}

/// The items of a comma-separated value, trimmed, empty ones dropped.
pub fn split_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The names of a `fields=a,b` value, and those of them `valid` refuses.
pub fn field_names(raw: &str, valid: impl Fn(&str) -> bool) -> (Vec<String>, Vec<String>) {
    let names = split_list(raw);
    let bad = names.iter().filter(|n| !valid(n)).cloned().collect();
    (names, bad)
}

/// `fields` (1.8, 406 below) and `detail` (1.43, 400 below) as Ironic gates them.
pub fn check_query_versions(
    params: &HashMap<String, String>,
    version: (u32, u32),
) -> Result<(), ApiError> {
    if params.contains_key("fields") && version < mv::FIELDS {
        return Err(not_acceptable("fields", mv::FIELDS));
    }
    if let Some(d) = params.get("detail") {
        if version < mv::DETAIL_QUERY {
            return Err(ApiError::bad_request(format!(
                "Invalid query parameter ?detail={d} received."
            )));
        }
    }
    Ok(())
}

/// A full page's `next` link, the one builder of every listing's (the resources', nodes',
/// conductors', a node's history, the audit trail): `{base}{path}?limit=N`, then the query
/// parameters the listing carries over and the marker, in the order the listing adds them.
/// Every key and value is percent-encoded ([`query_escape`]), so a filter value with `&`,
/// `+`, `=`, `%`, `#`, a space or non-ASCII text reads back the same on the next page.
#[must_use]
pub struct NextLink(String);

impl NextLink {
    /// `{base}{path}?limit={limit}`.
    pub fn new(base: &str, path: &str, limit: usize) -> Self {
        NextLink(format!("{base}{path}?limit={limit}"))
    }

    /// `&key=value`, both escaped.
    pub fn param(mut self, key: &str, value: &str) -> Self {
        self.0.push('&');
        self.0.push_str(&query_escape(key));
        self.0.push('=');
        self.0.push_str(&query_escape(value));
        self
    }

    /// `&key=value` when the value is there.
    pub fn param_if(self, key: &str, value: Option<&str>) -> Self {
        match value {
            Some(v) => self.param(key, v),
            None => self,
        }
    }

    /// The request's parameters named in `keys`, in that order, except `limit` and
    /// `marker` (the link sets its own).
    pub fn params_of(mut self, params: &HashMap<String, String>, keys: &[&str]) -> Self {
        for k in keys.iter().filter(|k| !matches!(**k, "limit" | "marker")) {
            if let Some(v) = params.get(*k) {
                self = self.param(k, v);
            }
        }
        self
    }

    /// Every parameter of the request but `limit` and `marker`, sorted by key.
    pub fn all_params(self, params: &HashMap<String, String>) -> Self {
        let mut keys: Vec<&str> = params.keys().map(String::as_str).collect();
        keys.sort_unstable();
        self.params_of(params, &keys)
    }

    /// `&marker={last}`.
    pub fn marker(self, last: &str) -> Self {
        self.param("marker", last)
    }

    /// The link.
    pub fn build(self) -> String {
        self.0
    }
}

/// The `next` link of a full page that carries every other parameter of the request over
/// (sorted by key), its marker last.
pub fn next_link(
    base: &str,
    path: &str,
    params: &HashMap<String, String>,
    limit: usize,
    last: &str,
) -> String {
    NextLink::new(base, path, limit)
        .all_params(params)
        .marker(last)
        .build()
}

/// A query key or value percent-encoded: everything but RFC 3986's unreserved characters
/// and `,` (a list's separator, which no query parser reads specially) becomes `%XX` of its
/// UTF-8 bytes.
pub fn query_escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~,".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::Query;
    use axum::http::Uri;

    /// The query of a link as a handler's `Query` reads it.
    fn parsed(link: &str) -> HashMap<String, String> {
        let uri: Uri = link.parse().expect("a URI");
        Query::<HashMap<String, String>>::try_from_uri(&uri)
            .expect("a query")
            .0
    }

    const AWKWARD: &[&str] = &[
        "a&b",
        "a+b",
        "50%",
        "x=y",
        "two words",
        " lead",
        "ünïcödé ☃",
        "#frag",
        "a,b",
        "%41",
        "?q",
        "a/b",
        "",
    ];

    #[test]
    fn every_awkward_value_reads_back_from_the_next_link() {
        for v in AWKWARD {
            let params = HashMap::from([
                ("name".to_string(), v.to_string()),
                ("limit".to_string(), "99".to_string()),
                ("marker".to_string(), "old".to_string()),
                (format!("k{v}"), v.to_string()),
            ]);
            let link = next_link("http://h:1", "/v1/ports", &params, 2, "last&one");
            assert!(!link.contains('#') && !link.contains(' '), "{link}");
            let back = parsed(&link);
            assert_eq!(back.get("name").map(String::as_str), Some(*v), "{link}");
            assert_eq!(
                back.get(&format!("k{v}")).map(String::as_str),
                Some(*v),
                "{link}"
            );
            assert_eq!(back.get("limit").map(String::as_str), Some("2"), "{link}");
            assert_eq!(
                back.get("marker").map(String::as_str),
                Some("last&one"),
                "{link}"
            );
            assert_eq!(back.len(), 4, "{link}");
        }
    }

    #[test]
    fn the_builder_keeps_the_order_it_is_given() {
        let params = HashMap::from([
            ("b".to_string(), "1".to_string()),
            ("a".to_string(), "x y".to_string()),
            ("limit".to_string(), "5".to_string()),
        ]);
        let link = NextLink::new("http://h", "/v1/nodes", 5)
            .marker("m")
            .params_of(&params, &["limit", "b", "a", "c"])
            .param_if("detail", Some("True"))
            .param_if("none", None)
            .build();
        assert_eq!(
            link,
            "http://h/v1/nodes?limit=5&marker=m&b=1&a=x%20y&detail=True"
        );
        assert_eq!(
            next_link("http://h", "/v1/x", &params, 5, "m"),
            "http://h/v1/x?limit=5&a=x%20y&b=1&marker=m"
        );
        assert_eq!(query_escape("a&b+c=d%e#f g"), "a%26b%2Bc%3Dd%25e%23f%20g");
        assert_eq!(query_escape("é"), "%C3%A9");
    }
}
