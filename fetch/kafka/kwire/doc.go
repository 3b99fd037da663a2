// Package kwire is kmirror's Kafka wire layer for the data path: broker
// connections with version negotiation, and hand-encoded Fetch and Produce
// requests that keep record batches as raw bytes end to end, so a batch
// fetched from the source can be forwarded to the destination without being
// decompressed (design.md section 4).
//
// kafka-go's protocol package decodes every batch it reads and re-encodes
// every batch it writes, and its Transport serves Metadata from a cache that
// cannot be refreshed on demand. kwire keeps kafka-go's typed messages for
// small requests (Metadata, ListOffsets, InitProducerId) by sending them with
// protocol.RoundTrip over its own connections, and encodes Fetch and Produce
// itself.
package kwire
