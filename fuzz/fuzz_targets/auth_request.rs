#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fabric_fuzz::auth_request::check(data));
