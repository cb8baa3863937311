// Package steer owns the activation-steering model of shmsteer: the model config recorded in a
// region, named steering vectors, global and per-request steering, conversation latches, the
// per-step apply over hidden states. The gorgonia tensor adapter is package steer/dense, kept
// apart so that a worker steering plain []float32 blocks does not compile gorgonia.
//
// To start: the owner opens its side over the region it created (Open with the model config:
// an *Owner) and serves workers' writes (Owner.Serve); a worker opens its side over the region
// it attached to (Attach: a *Worker; a nil config reads the region's) with its transport to
// the owner as Options.Caller. Opening the other side's region is ErrNotOwner. Both embed an
// *Engine, what the sides share: the reads, the writes a worker sends to the owner (Register,
// Unregister, the probe writes, SetGlobal) and the Steppers; the owner's own operations
// (Admit, End, DropConversation, Latches, RestoreLatches, the conversations' gates, the capture
// consumers, OnChange, Serve) are methods of Owner only, so a worker cannot call them. Code
// that serves either side takes the *Engine (Owner.Engine, Worker.Engine). Each goroutine that
// steers takes a Stepper (NewStepper) and, per step, Begin at the version the scheduler handed
// out, Apply at each hook, End. A worker that applies one batch at every hook
// of a step binds it once after Begin (Bind) and calls ApplyBound at each hook, which does not
// compare the batch again (bound.go). Both run one executor: the batch layout's program, a list
// of operations per site (runs, pairs, clamps, gated spans, capture) built at the site's first
// apply and kept from step to step while the compositions it read keep their versions
// (program.go).
//
// # Vocabulary
//
// Hooks are the points of a transformer layer whose hidden states a Stepper steers: Apply(hook,
// layer, h, …) adds to the T×hidden block h the model hands over at that point. DefaultHooks
// are those of the reference vLLM fork, for layer L:
//
//   - pre_attn: the residual stream entering attention;
//   - post_attn: the residual stream after attention's output is added;
//   - post_block: the block's output, the hidden state entering layer L+1 (where llama.cpp adds
//     a control vector's direction.L: the common choice for control vectors);
//   - mlp_in: the normalised MLP input;
//   - mlp_out: the MLP branch's output, after the down-projection (and its all-reduce under
//     tensor parallelism), before the residual add.
//
// A ModelConfig may name other hooks; the names only have to match between the code that
// registers steering and the code that calls Apply.
//
// A steering set maps (hook, layer) to vectors added with a scale (inline, or by reference to
// a named vector with a strength) and clamps, in three tiers: base (every row) and prefill and
// decode (only rows in that phase). The effective steering of a row is global base + global
// phase + request base + request phase. MaxMagnitude bounds what may be added.
//
// A conversation (ConvKey: tenant and id; an empty id means none) carries steering from turn to
// turn: a request admitted with an override triggers a latch, recording the override as its
// conversation's steering (replacing the older one); a later request of the conversation
// admitted without an override bridges: it inherits the latched steering. A latch ends when
// replaced, dropped (DropConversation, or a named vector it references changed or was
// unregistered, detected at the next bridge) or evicted to fit the caps (LatchConfig; LatchOff
// turns latching off).
//
// # Where the state lives
//
// Everything every rank must agree on lives once, in the shared region, under the kinds this
// package owns (16..31):
//
//   - KindVector (16), key = name: a named steering set, in the steering wire format (below),
//     carrying its sha256 content digest; the region version that wrote it is its version.
//   - KindGlobal (17), key "global": the global base, prefill and decode tiers.
//   - KindRequest (18), key = request id: the steering admitted for a request (its own
//     override and/or the latched steering of its conversation; an empty set if neither),
//     written by the owner when the request is admitted and deleted when it ends.
//   - KindStatus (19), key "latches": the latch counters and the owner's count of
//     compositions that found the column pool full (Status.ColumnsFallbacks), so Status reads
//     the same numbers in every process.
//   - KindComposed (20), key = request id, and KindComposedGlobal (21), key "global": the
//     request's and the global steering composed by the owner per site entry (site and
//     phase); a request's own vectors sit in the region's column pool (shm.ColumnPool), in
//     the columns its entry names and owns.
//   - KindProbe (22), key = name: a named probe vector, read by gates and never added, in the
//     steering wire format with one base vector at its one site (probe.go).
//   - KindGates (23), key = request id: the request's gates as the owner resolved them at
//     Admit, the vectors they name included, written with its steering (gates_admit.go).
//   - KindVectorMeta (24), key = name: a named steering vector's metadata (its model hint),
//     written with the vector and only when there is any (vmeta.go).
//   - KindCapture (25), key = request id: the request's capture specs as the owner validated
//     them at Admit against its declared consumers (Options.CaptureConsumers): each
//     consumer's raw spec, sites and positions, and the prompt length (capture.go;
//     Engine.Capture reads it).
//
// The conversation latch map (Latches) is deterministic owner-side state in private memory:
// only the scheduler decides admissions, and it publishes the result per request. Workers never
// see the map, only its effect, so a latch costs one copy in the owner instead of one per
// tensor-parallel rank, and eviction is a pure function of the sequence of latch operations.
//
// # Step apply
//
// A Stepper (one per goroutine) pins one snapshot per step (optionally a version the scheduler
// handed to every rank), and for each (hook, layer) adds every request's effective steering
// (global base + global phase + request base + request phase) to its rows and then applies its
// clamps. The owner composes each steering set once, when it is written, into the region
// (KindComposed per request, KindComposedGlobal for the global tiers; composed.go): workers
// read those floats in place, so no rank keeps a copy and no rank composes. A request's own
// vectors are laid out site by site in the region's column pool (RegionConfig sizes it), so
// the vectors a decode step adds at one (hook, layer) lie side by side. A row gets the
// request's composed vector and the global one (shared by every row, so read from cache); a
// global change rewrites one entry, and a named vector's change recomposes the sets that
// reference it in the same transaction. The batch layout is validated and resolved once per
// step (later Applies compare it), unsteered requests are skipped, and nothing is allocated.
// A 64-bit checksum over the actions applied (not over floats) lets ranks compare what they
// did.
//
// A worker that applies steering with its own kernels (a GPU worker) resolves each step once
// with a Batch (batch.go): slots per distinct steering set and phase, the per-row slot index,
// the steered sites and exactly the table rows whose composed content changed, so its hooked
// sites never call into the engine.
//
// # Declarative gates
//
// A request may carry the vLLM fork's gates, when × scope × apply (gates.go: DecodeGates reads
// its "steering" JSON, CheckGates is its validation). The owner resolves them at Admit
// (gates_admit.go: names to the probe or steering vectors registered then, digests included)
// and stores them under KindGates with the request; it carries a conversation's
// rest_of_conversation gates onto its later requests, engaged when a Stepper reported them
// engaged (OpGateEngaged), and exports its table for a state dir or a mirror (gates_conv.go). The Stepper applies them
// to decode rows (gates_step.go): probes read per row at their site, this_token adds gated per
// row, the other scopes advanced at End, attenuation as a per-request factor; every rank
// scores the probes itself, so ranks agree. A Batch gates the device path too
// (batch_gates.go): what is known when the step begins (attenuation, engaged adds) goes into
// the slot tables, each probe gate is a per-row gate column naming a gate slot (probe row,
// threshold, sharpness, this_token add rows) the worker evaluates at the probe's site, and the
// worker hands the scores back with Report, where the host-evaluated scopes decide and advance
// as at a Stepper's End; both paths give the same decisions (Stepper.GateChecksum).
//
// # Activation capture
//
// A request may carry a capture, {consumer: spec} (Admission.Capture, with its PromptLen): the
// owner validates each spec with the validator of a consumer it declares
// (Options.CaptureConsumers, built by package capture) and stores the specs, sites and
// positions with the request (KindCapture; Engine.Capture reads them). A Stepper given a
// CaptureSink (SetCapture: the writing rank only) copies, at each site and before steering
// it, the rows its consumers select by absolute position (Span.Pos + row; CapturePositions)
// into the sink, one CaptureRecord per (site, request) per step (capture_step.go): Apply
// captures float32 blocks, Capture blocks of other dtypes, and a Batch plans the rows a
// device worker gathers (CaptureSites, CaptureRows) and takes them back (Batch.Capture).
//
// # Boundaries
//
// steer reads and writes the region only through package shm's API (Update, Snapshot, View):
// it must not touch region layout internals, and it imports unsafe only in spans_unsafe.go,
// to compare a batch's bytes with the one resolved before (float views come from
// shm.AsFloat32). It opens no sockets and does not depend on the transport.
//
// # Owner and worker
//
// Which process writes is decided once, by Open, as the engine's writer (writer.go): in the
// owner every write is a local transaction under the engine's write mutex (local.go); in a
// worker with a Caller (an ipc client) every write is one RPC (remote.go), which the owner's
// Serve handlers turn into the same local write; a process with neither reads only. Each write
// has one method in every process (Register, Unregister, RegisterProbe, UnregisterProbe,
// SetGlobal; Admit, End, DropConversation and RestoreLatches are the owner's), qualified by
// WriteOptions (Merge, and the owner's Origin and If). Ops, kinds and remote error codes are
// internal/proto's.
package steer
