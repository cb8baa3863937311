package serve

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/steer"
)

// ClientSession is a CLI command attached to a running owner as an ipc client.
type ClientSession struct {
	Client *ipc.Client
	Keys   *keys.Worker
	Engine *steer.Worker

	namespace string
}

// AttachClient attaches to the owner of namespace with the secret from secretFile (or
// SHMSTEER_SECRET when empty).
func AttachClient(namespace, secretFile string) (*ClientSession, error) {
	opts := ipc.ClientOptions{Namespace: namespace, DropEnv: true}
	if secretFile != "" {
		sec, err := ipc.SecretFromFile(secretFile, ipc.SecretFileOptions{Private: true})
		if err != nil {
			return nil, err
		}
		opts.Secret = &sec
	}
	c, err := ipc.Attach(opts)
	if err != nil {
		return nil, fmt.Errorf("attaching to the owner of namespace %q: %w", namespace, err)
	}
	reg, err := keys.Attach(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	eng, err := steer.Attach(c.Region(), nil, steer.Options{Caller: c})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &ClientSession{Client: c, Keys: reg, Engine: eng, namespace: namespace}, nil
}

// Close detaches.
func (cs *ClientSession) Close() error { return cs.Client.Close() }

// PrintStatus writes the status as JSON or as aligned text.
func (cs *ClientSession) PrintStatus(w io.Writer, asJSON bool) error {
	st, err := regionStatus(cs.Engine.Engine)
	if err != nil {
		return err
	}
	st.APIKeys = -1
	st.Namespace = cs.namespace
	if gw, err := readGateWork(cs.Client); err == nil { // serve collects them; another owner does not
		st.GateWork = &gw
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	b, _ := json.Marshal(st)
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		return err
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		if k != "api_keys" && k != "namespace" && k != "state_saves" && k != "state_dirty" && k != "uptime_seconds" && k != "modules" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "namespace\t%s\nowner_pid\t%d\n", cs.namespace, cs.Client.OwnerPID())
	for _, k := range keys {
		v := m[k]
		if k == "attached_clients" && st.AttachedClients < 0 {
			// Only the owner counts its clients; this command is one of them.
			v = "unknown to a client (the owner's count: GET /v1/status, shmsteer_attached_clients)"
		}
		printStatusValue(tw, k, v)
	}
	return tw.Flush()
}

// KeysList prints the request ids with a live key, never key bytes, and how many revoked
// sentinels stand (their ids are stored hashed: only the owner knows them).
func (cs *ClientSession) KeysList(w io.Writer) error {
	var ids []string
	err := cs.Keys.Range(func(id string, revoked bool) bool {
		if !revoked {
			ids = append(ids, id)
		}
		return true
	})
	if err != nil {
		return err
	}
	st, err := cs.Engine.Status()
	if err != nil {
		return err
	}
	sort.Strings(ids)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REQUEST ID\tSTATE")
	for _, id := range ids {
		fmt.Fprintf(tw, "%s\tlive\n", id)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%d live, %d revoked (revoked ids are stored hashed until their purge)\n", len(ids), st.RevokedKeys)
	return err
}

// VectorsList prints the named vectors: steering vectors, then probes.
func (cs *ClientSession) VectorsList(w io.Writer) error {
	list, err := vectorSummaries(cs.Engine.Engine, func(string) bool { return true })
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tENTRIES\tVERSION\tDIGEST\tMODEL HINT")
	for _, v := range list {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", v.Name, v.Kind, v.Entries, v.Version, v.Digest[:16], v.ModelHint)
	}
	return tw.Flush()
}

// VectorShow prints one named vector's entries (hook, layer, scale, norm).
func (cs *ClientSession) VectorShow(w io.Writer, name string) error {
	snap, err := cs.Engine.Region().Snapshot()
	if err != nil {
		return err
	}
	defer snap.Close()
	nv, err := cs.Engine.Vector(&snap, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "name %s\nversion %d\ndigest %s\n", nv.Name, nv.Version, hex.EncodeToString(nv.Digest[:]))
	if m, err := cs.Engine.VectorMeta(&snap, name); err != nil {
		return err
	} else if m.ModelHint != "" {
		fmt.Fprintf(w, "model_hint %s\n", m.ModelHint)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOOK\tLAYER\tSCALE\tNORM")
	for _, v := range nv.Vectors {
		fmt.Fprintf(tw, "%s\t%d\t%g\t%.6g\n", v.Hook, v.Layer, v.Scale, kernels.Norm(v.Data))
	}
	return tw.Flush()
}

// GlobalSetFromFile sets global steering from a JSON file in the /v1/steering/set format
// ("-" reads stdin) plus refs "name" or "name=strength".
func (cs *ClientSession) GlobalSet(file string, refs []string, replace bool) (uint64, error) {
	var req setRequest
	if file != "" {
		var b []byte
		var err error
		if file == "-" {
			b, err = io.ReadAll(os.Stdin)
		} else {
			b, err = os.ReadFile(file)
		}
		if err != nil {
			return 0, err
		}
		if err := decodeStrict(b, &req); err != nil {
			return 0, fmt.Errorf("%s: %w", file, err)
		}
		replace = replace || req.Replace
	}
	st, err := req.Steering(cs.Engine.Config())
	if err != nil {
		return 0, err
	}
	for _, r := range refs {
		name, s, has := strings.Cut(r, "=")
		strength := float32(1)
		if has {
			f, err := strconv.ParseFloat(s, 32)
			if err != nil {
				return 0, badInput("--ref %q: strength is not a number", r)
			}
			strength = float32(f)
		}
		st.Base.Refs = append(st.Base.Refs, steer.Ref{Name: name, Strength: strength})
	}
	if st.Empty() {
		return 0, badInput("nothing to set: give --file with vectors or clamps, or --ref NAME[=STRENGTH]")
	}
	if err := cs.checkOwn(&st); err != nil {
		return 0, err
	}
	return cs.Engine.SetGlobal(st, mergeUnless(replace)...)
}

// checkOwn checks what the user gave before it is merged into the current global steering, so
// an error names the user's own entries (a site, a name), not an index into the merged set.
func (cs *ClientSession) checkOwn(st *steer.Steering) error {
	cfg := cs.Engine.Config()
	snap, err := cs.Engine.Region().Snapshot()
	if err != nil {
		return err
	}
	defer snap.Close()
	infos, err := cs.Engine.VectorInfos(&snap)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, in := range infos {
		known[in.Name] = true
	}
	for _, ph := range []steer.Phase{steer.PhaseBase, steer.PhasePrefill, steer.PhaseDecode} {
		t := st.Tier(ph)
		for _, v := range t.Vectors {
			if len(v.Data) != cfg.Hidden {
				return fmt.Errorf("%w: the %s vector at %s layer %d has %d floats, hidden size is %d", steer.ErrHiddenSize, ph, v.Hook, v.Layer, len(v.Data), cfg.Hidden)
			}
		}
		for _, r := range t.Refs {
			if !known[r.Name] {
				return fmt.Errorf("%w: %q (the %s tier's reference; `shmsteer vectors ls` lists the registered names)", steer.ErrUnknownVector, r.Name, ph)
			}
		}
	}
	return nil
}
