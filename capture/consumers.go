package capture

import (
	"fmt"
	"sort"
	"strings"

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
