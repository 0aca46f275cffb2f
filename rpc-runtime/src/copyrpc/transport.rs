//! Typed-service transports over copyrpc (to be written: `Copyrpc`, `CopyrpcServer`).
