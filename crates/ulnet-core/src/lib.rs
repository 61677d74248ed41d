//! ulnet-core: user-level endpoints.
#![deny(missing_docs)]
