//! Exists so that user-space crates can name this package as a build dependency (which makes
//! cargo rebuild them when it changes). The programs are the `fabric` binary target.
#![no_std]
