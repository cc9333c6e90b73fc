//! The zlib dictionary of SPDY/3 header blocks, as the SPDY/3 draft defines it: 65 common
//! header names and values, each behind a 32-bit big-endian length, then a run of status
//! lines, dates and media types without lengths. Both ends prime their compressors with it.
use std::sync::LazyLock;

const WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

const TAIL: &[&str] = &[
    "10010120120220520630030230330430530630740240540640740840941041141241341441541641",
    "7502504505203 Non-Authoritative Information204 No Content301 Moved Permanently40",
    "0 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error",
    "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept O",
    "ct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,imag",
    "e/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/",
    "javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1",
    ",utf-,*,enq=0.",
];

/// The dictionary's bytes (1423 of them).
pub static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut d = Vec::with_capacity(1423);
    for w in WORDS {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    for t in TAIL {
        d.extend_from_slice(t.as_bytes());
    }
    d
});

#[cfg(test)]
mod tests {
    #[test]
    fn is_the_specified_dictionary() {
        let d = &*super::DICTIONARY;
        assert_eq!(d.len(), 1423);
        // The DICTID every SPDY/3 peer's zlib stream carries in its header.
        let (mut a, mut b) = (1u32, 0u32);
        for &x in d {
            a = (a + x as u32) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!((b << 16) | a, 0xe3c6_a7c2);
    }
}
