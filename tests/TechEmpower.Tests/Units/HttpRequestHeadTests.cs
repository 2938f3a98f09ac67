using System.Text;
using TechEmpower.Platform;

namespace TechEmpower.Tests.Units;

public sealed class HttpRequestHeadTests
{
    private static HttpRequestHead Parse(string head) => HttpRequestHead.Parse(Encoding.Latin1.GetBytes(head));

    [Theory]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x", PlatformRoute.Plaintext)]
    [InlineData("GET /json HTTP/1.1\r\nHost: x\r\nAccept: */*", PlatformRoute.Json)]
    [InlineData("GET /json?x=1 HTTP/1.1\r\nhost:x", PlatformRoute.Json)]
    [InlineData("GET /jsonx HTTP/1.1\r\nHost: x", PlatformRoute.NotFound)]
    [InlineData("GET / HTTP/1.1\r\nHost: x", PlatformRoute.NotFound)]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\nContent-Length: 0", PlatformRoute.Plaintext)]
    public void Get_requests_are_served_by_path_and_kept_alive(string head, PlatformRoute route)
    {
        var request = Parse(head);
        Assert.Equal(RequestVerdict.Serve, request.Verdict);
        Assert.Equal(route, request.Route);
        Assert.True(request.KeepAlive);
    }

    [Theory]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\nConnection: close", false)]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\nconnection: Keep-Alive, Close", false)]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\nConnection: keep-alive", true)]
    [InlineData("GET /plaintext HTTP/1.0", false)]
    [InlineData("GET /plaintext HTTP/1.0\r\nConnection: keep-alive", true)]
    public void Connection_header_and_version_decide_keep_alive(string head, bool keepAlive)
    {
        var request = Parse(head);
        Assert.Equal(RequestVerdict.Serve, request.Verdict);
        Assert.Equal(keepAlive, request.KeepAlive);
    }

    [Theory]
    [InlineData("POST /json HTTP/1.1\r\nHost: x")]
    [InlineData("HEAD /plaintext HTTP/1.1\r\nHost: x")]
    [InlineData("get /plaintext HTTP/1.1\r\nHost: x")]
    public void Other_methods_are_not_allowed(string head) =>
        Assert.Equal(RequestVerdict.MethodNotAllowed, Parse(head).Verdict);

    [Theory]
    [InlineData("")]
    [InlineData("GARBAGE")]
    [InlineData("GET /plaintext")]
    [InlineData("GET  /plaintext HTTP/1.1\r\nHost: x")]
    [InlineData("GET /plaintext  HTTP/1.1\r\nHost: x")]
    [InlineData("GET plaintext HTTP/1.1\r\nHost: x")]
    [InlineData("GET http://x/plaintext HTTP/1.1\r\nHost: x")]
    [InlineData("GET /plain\u007ftext HTTP/1.1\r\nHost: x")]
    [InlineData("GET /pl\u00e4intext HTTP/1.1\r\nHost: x")]
    [InlineData("GET /plaintext HTTP/2.0\r\nHost: x")]
    [InlineData("GET /plaintext http/1.1\r\nHost: x")]
    [InlineData("GET /plaintext HTTP/1.1 \r\nHost: x")]
    [InlineData("G(T /plaintext HTTP/1.1\r\nHost: x")]
    [InlineData("GET /plaintext HTTP/1.1")]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\nHost: y")]
    [InlineData("GET /plaintext HTTP/1.0\r\nHost: x\r\nHost: y")]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost x")]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost : x")]
    [InlineData("GET /plaintext HTTP/1.1\r\n: x\r\nHost: x")]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\n folded")]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\nX: a\u0000b")]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\nX: a\nb")]
    [InlineData("GET /plaintext HTTP/1.1\nHost: x")]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\n")]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\nContent-Length: 3")]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\nContent-Length: ")]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\nContent-Length: -0")]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked")]
    public void Malformed_heads_and_bodies_are_bad_requests_that_close(string head)
    {
        var request = Parse(head);
        Assert.Equal(RequestVerdict.BadRequest, request.Verdict);
        Assert.False(request.KeepAlive);
    }

    [Theory]
    [InlineData("", true)]
    [InlineData("G", true)]
    [InlineData("GET /plain", true)]
    [InlineData("GET /plaintext HTTP/1.1\r", true)]
    [InlineData("GET /plaintext HTTP/1.1\r\nHo", true)]
    [InlineData("\u0016\u0003\u0001", false)]
    [InlineData("GE\nT", false)]
    [InlineData(" GET", false)]
    [InlineData("GARBAGE\r\n", false)]
    [InlineData("GET /plaintext HTTP/3\r\nHost: x", false)]
    public void Incomplete_heads_are_judged_by_what_has_arrived(string start, bool plausible) =>
        Assert.Equal(plausible, HttpRequestHead.IsPlausibleStart(Encoding.Latin1.GetBytes(start)));
}
