package protocol

import "encoding/json"

// decodeJSONHeaderStd is the reference JSON header decoder the hand-written one replaced:
// encoding/json into a struct, with extFields values of any type taken as their text. The tests and FuzzDecodeFrame require both to accept the same
// inputs and produce the same commands.
func decodeJSONHeaderStd(b []byte) (*Command, error) {
	var h struct {
		Code      int32                      `json:"code"`
		Language  json.RawMessage            `json:"language,omitempty"`
		Version   int16                      `json:"version"`
		Opaque    int32                      `json:"opaque"`
		Flag      int32                      `json:"flag"`
		Remark    string                     `json:"remark,omitempty"`
		ExtFields map[string]json.RawMessage `json:"extFields,omitempty"`
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, err
	}
	c := &Command{Code: h.Code, Version: h.Version, Opaque: h.Opaque, Flag: h.Flag, Remark: h.Remark, Language: LangOther}
	// extFields values of any JSON type are read as their text, the way fastjson reads them
	// into the Java broker's HashMap<String,String>: strings unquoted, numbers, booleans,
	// objects and arrays as written, null as absent.
	if h.ExtFields != nil {
		c.ExtFields = make(map[string]string, len(h.ExtFields))
		for k, raw := range h.ExtFields {
			switch {
			case string(raw) == "null":
			case raw[0] == '"':
				var s string
				if err := json.Unmarshal(raw, &s); err != nil {
					return nil, err
				}
				c.ExtFields[k] = s
			default:
				c.ExtFields[k] = string(raw)
			}
		}
	}
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
