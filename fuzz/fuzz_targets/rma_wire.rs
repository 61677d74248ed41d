//! Remote memory requests and responses: any bytes never panic, and what decodes is
//! exactly what encoding it again gives (no field is read loosely).
#![no_main]
use libfuzzer_sys::fuzz_target;
use ulnet_core::rma::wire::{
    decode_request, decode_response, encode_response, peek_token, split_requests, Response, HEADER_LEN,
};

fuzz_target!(|data: &[u8]| {
    let _ = peek_token(data);
    for bytes in split_requests(data) {
        if let Ok(request) = decode_request(bytes) {
            let mut head = [0u8; HEADER_LEN + 16];
            let mut again = request.encode_head(&mut head).to_vec();
            again.extend_from_slice(request.body_tail());
            assert_eq!(again, bytes, "a request encodes back to its bytes");
        }
    }
    if let Ok(response) = decode_response(data) {
        let mut again = encode_response(&response).to_vec();
        if let Response::GetData { data: payload, .. } = response {
            again.extend_from_slice(payload);
        }
        assert_eq!(again, data, "a response encodes back to its bytes");
    }
});
