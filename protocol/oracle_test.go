package protocol

import "encoding/json"

// decodeJSONHeaderStd is the reference JSON header decoder the hand-written one replaced:
// encoding/json into a struct. The tests and FuzzDecodeFrame require both to accept the same
// inputs and produce the same commands.
func decodeJSONHeaderStd(b []byte) (*Command, error) {
	var h struct {
		Code      int16             `json:"code"`
		Language  json.RawMessage   `json:"language,omitempty"`
		Version   int16             `json:"version"`
		Opaque    int32             `json:"opaque"`
		Flag      int32             `json:"flag"`
		Remark    string            `json:"remark,omitempty"`
		ExtFields map[string]string `json:"extFields,omitempty"`
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, err
	}
	c := &Command{Code: h.Code, Version: h.Version, Opaque: h.Opaque, Flag: h.Flag, Remark: h.Remark, ExtFields: h.ExtFields, Language: LangOther}
	if len(h.Language) > 0 {
		var name string
		var num int8
		switch {
		case json.Unmarshal(h.Language, &name) == nil:
			c.Language = ParseLanguage(name)
		case json.Unmarshal(h.Language, &num) == nil:
			c.Language = LanguageCode(num)
		}
	}
	if c.ExtFields == nil {
		c.ExtFields = map[string]string{}
	}
	return c, nil
}
