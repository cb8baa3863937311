package serve

import "github.com/shmsteer/shmsteer/internal/proto"

// opNames labels the owner's RPC ops in /metrics (shmsteer_rpc_seconds{op=...}): every user op
// of the table in internal/proto has its name (TestOpNamesCoverTable walks the table).
var opNames = map[uint16]string{
	proto.OpRegister:        "register",
	proto.OpUnregister:      "unregister",
	proto.OpSetGlobal:       "set_global",
	proto.OpRegisterProbe:   "register_probe",
	proto.OpUnregisterProbe: "unregister_probe",
	proto.OpGateEngaged:     "gate_engaged",
	proto.OpCaptureTicket:   "capture_ticket",
	proto.OpReportChecksum:  "report_checksum",
	proto.OpReportGates:     "report_gates",
	proto.OpGateWork:        "gate_work",
	proto.OpKeySet:          "key_set",
	proto.OpKeyRemove:       "key_remove",
	proto.OpKeyLimits:       "key_limits",
}
