package capture

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/shmsteer/shmsteer/steer"
)

// The consumer types an owner can declare, by the spec format their requests carry.
const (
	// TypeFilesystem is the filesystem consumer: specs are the fork's FilesystemCaptureRequest
	// (DecodeFilesystemSpec), rows land under its root in the fork's layout.
	TypeFilesystem = "filesystem"
)

var validatorsByType = map[string]steer.CaptureValidator{TypeFilesystem: ValidateFilesystem}

// ParseDeclaration reads one consumer declaration, NAME=TYPE (serve's --capture-consumer):
// ErrBadConsumer for a bad name, ErrConsumerType for an unknown type.
func ParseDeclaration(s string) (name, typ string, err error) {
	name, typ, ok := strings.Cut(s, "=")
	if !ok {
		return "", "", fmt.Errorf("%w: %q, want NAME=TYPE (types: %s)", ErrConsumerType, s, typeNames())
	}
	if err := checkConsumerName(name); err != nil {
		return "", "", err
	}
	if _, ok := validatorsByType[typ]; !ok {
		return "", "", fmt.Errorf("%w: %q for consumer %q (types: %s)", ErrConsumerType, typ, name, typeNames())
	}
	return name, typ, nil
}

func typeNames() string {
	var ns []string
	for t := range validatorsByType {
		ns = append(ns, t)
	}
	sort.Strings(ns)
	return strings.Join(ns, ", ")
}

// Validators turns the owner's declared consumers, {name: type}, into the validators
// steer.Options.CaptureConsumers takes: ErrBadConsumer for a bad name, ErrConsumerType for an
// unknown type. An empty declaration is no consumer (every capture is refused).
func Validators(decl map[string]string) (map[string]steer.CaptureValidator, error) {
	if len(decl) > MaxConsumers {
		return nil, fmt.Errorf("%w: %d consumers declared, at most %d", ErrBadConsumer, len(decl), MaxConsumers)
	}
	out := make(map[string]steer.CaptureValidator, len(decl))
	for name, typ := range decl {
		if err := checkConsumerName(name); err != nil {
			return nil, err
		}
		v, ok := validatorsByType[typ]
		if !ok {
			return nil, fmt.Errorf("%w: %q for consumer %q (types: %s)", ErrConsumerType, typ, name, typeNames())
		}
		out[name] = v
	}
	return out, nil
}

// ValidateFilesystem is the filesystem consumer's steer.CaptureValidator: DecodeFilesystemSpec
// then Resolve against cfg and promptLen, and the plan's sites and positions.
func ValidateFilesystem(cfg steer.ModelConfig, spec []byte, promptLen int) (steer.CaptureSelect, error) {
	s, err := DecodeFilesystemSpec(spec)
	if err != nil {
		return steer.CaptureSelect{}, err
	}
	if promptLen > steer.MaxPromptLen {
		return steer.CaptureSelect{}, fmt.Errorf("%w: prompt length %d, at most %d", ErrPositionRange, promptLen, steer.MaxPromptLen)
	}
	p, err := s.Resolve(cfg, promptLen)
	if err != nil {
		return steer.CaptureSelect{}, err
	}
	return p.Select(cfg.Layers), nil
}

// GlobalSpecs builds steer.Options.CaptureGlobal from the declared consumers ({name: type})
// and their global specs ({name: raw JSON}: serve's --capture-global NAME=@FILE). A
// filesystem consumer's global spec is its FilesystemCaptureRequest without request_id: each
// request it captures writes under its own id (slugged as a request's request_id is). The
// model-independent checks are made here (ErrBadConsumer for a consumer not declared, ErrBadSpec
// and DecodeFilesystemSpec's errors for a bad spec), the rest by steer.Open, as a request's
// spec is checked at admission.
func GlobalSpecs(decl map[string]string, specs map[string][]byte) (map[string]steer.CaptureGlobalSpec, error) {
	out := make(map[string]steer.CaptureGlobalSpec, len(specs))
	for name, raw := range specs {
		switch decl[name] {
		case TypeFilesystem:
			g, err := filesystemGlobal(raw)
			if err != nil {
				return nil, fmt.Errorf("capture consumer %q's global spec: %w", name, err)
			}
			out[name] = g
		default:
			return nil, fmt.Errorf("%w: global spec for %q, which is not a declared consumer (declare it: NAME=filesystem)", ErrBadConsumer, name)
		}
	}
	return out, nil
}

// filesystemGlobal checks a filesystem consumer's global spec and returns its instantiation:
// the spec with the request's id as request_id.
func filesystemGlobal(raw []byte) (steer.CaptureGlobalSpec, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("%w: a global spec must be a JSON object with tag, hooks, positions and optionally layout", ErrBadSpec)
	}
	if _, ok := fields["request_id"]; ok {
		return nil, fmt.Errorf("%w: a global spec has no request_id: each request is written under its own id", ErrBadSpec)
	}
	inst := func(requestID string) ([]byte, error) {
		if !utf8.ValidString(requestID) {
			return nil, fmt.Errorf("%w: request id %q is not UTF-8 (a global spec's request_id is the request's id, in JSON)", ErrBadSlug, requestID)
		}
		id, err := json.Marshal(requestID)
		if err != nil {
			return nil, fmt.Errorf("%w: request id: %v", ErrBadSpec, err)
		}
		f := make(map[string]json.RawMessage, len(fields)+1)
		for k, v := range fields {
			f[k] = v
		}
		f["request_id"] = id
		return json.Marshal(f)
	}
	probe, err := inst("global-spec-check")
	if err != nil {
		return nil, err
	}
	if _, err := DecodeFilesystemSpec(probe); err != nil {
		return nil, err
	}
	return inst, nil
}
